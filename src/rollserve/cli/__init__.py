"""The rollserve command line."""
