"""Exit 0 if this namespace reaches ADDRESS over TCP (ping is not installed).

Nobody listens on port 9 (discard) there, so a refused connection proves the path works; a timeout or
"network unreachable" proves it does not.
"""

import socket
import sys

address = sys.argv[1]
try:
    socket.create_connection((address, 9), timeout=5).close()
except ConnectionRefusedError:
    pass
except OSError as error:
    sys.exit(f"{address}: {error}")
