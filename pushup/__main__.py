import sys

from pushup.ops.cli import main

sys.exit(main())
