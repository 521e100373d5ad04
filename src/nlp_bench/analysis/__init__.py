"""From job output to numbers: log parsers, metrics, and the result store."""
