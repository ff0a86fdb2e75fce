"""The pages' routers, one module per page."""
