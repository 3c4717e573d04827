"""Connectors, commands and attempts arrive with the commands issue."""
