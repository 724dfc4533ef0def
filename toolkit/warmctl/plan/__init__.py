"""The instance plan: everything derived from the inventory, once (names, ports, paths, the
server's argv and environment, the units' commands and sandbox), and the files rendered from it."""
