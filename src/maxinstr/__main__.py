import sys

from maxinstr.cli import main

sys.exit(main())
