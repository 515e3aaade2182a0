import sys

from flightsrv.cli import main

sys.exit(main())
