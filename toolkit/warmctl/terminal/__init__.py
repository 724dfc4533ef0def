"""Output for a person or a machine: tables, JSON, journald priorities, live wait lines, escaped
server text."""
