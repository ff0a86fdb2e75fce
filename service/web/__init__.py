"""The results pages (server-rendered HTML and SVG) served by the service app."""
