"""Example applications, written the way we want users to write theirs."""
