"""The in-sandbox agent: a small HTTP server that runs commands and handles files inside one sandbox."""
