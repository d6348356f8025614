"""The HTTP routes, one module per service: messaging, transactions, operations."""
