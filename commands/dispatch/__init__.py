"""Dispatch: the loop that sends queued commands."""
