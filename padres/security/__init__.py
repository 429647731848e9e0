"""Security: accounts, credentials and grants, and TLS contexts."""
