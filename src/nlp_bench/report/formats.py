"""The formats a table can be printed or exported in, named apart from the code that writes them so that
the command line lists them without loading pandas."""

TABLE_FORMATS = ("pretty", "csv", "json", "md")
#: a table format or, for `bench result export`, a file format; `submission` is the bundle folder
EXPORT_FORMATS = ("csv", "json", "md", "html", "tex", "parquet", "sqlite", "submission")
