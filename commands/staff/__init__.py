"""Staff: what people use to watch and act on commands (admin, dashboard, REST API, actions)."""
