"""Queue items arrive with the queues issue."""
