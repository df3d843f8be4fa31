"""The audit log: who created, changed or removed keys and users, and who signed in, from every surface."""
