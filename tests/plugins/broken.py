"""A module named as a plug-in that has no register function."""
