import sys

from pushup.cli import main

sys.exit(main())
