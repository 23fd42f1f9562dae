"""The process boundary: the user's code runs only in a child process started here."""
