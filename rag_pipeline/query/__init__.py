"""Reading the index: retrieval shared by `search` and `ask`, and answers that cite."""
