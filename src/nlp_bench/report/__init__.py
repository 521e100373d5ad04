"""Tables and exports of results."""
