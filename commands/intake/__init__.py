"""Intake: the two front doors (webhooks, REST submission) that turn a request into stored commands."""
