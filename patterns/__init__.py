"""Architecture pattern data (TOML). Not code: see README.md here."""
