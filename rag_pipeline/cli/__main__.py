"""`python -m rag_pipeline.cli …`, as the scripts and tests call it without the console script."""

import sys

from rag_pipeline.cli import main

sys.exit(main())
