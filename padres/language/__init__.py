"""The PADRES text language: the parser, batches of lines, and the stock quote data set."""
