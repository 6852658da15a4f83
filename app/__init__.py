"""gradscape's server and web app (the live server and UI arrive in later issues)."""
