"""A command run as a user runs it at a terminal: in a pseudo-terminal of a chosen width, with Ctrl-C typed
on the keyboard (the terminal sends SIGINT to every process of the foreground group, workers included)."""
import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass
class TerminalRun:
    output: str
    exit_code: int
    seconds_after_ctrl_c: Optional[float]


def run_in_terminal(argv: Sequence[str], *, columns: int = 80, ctrl_c_after: Optional[str] = None,
                    env: Optional[dict] = None, timeout: float = 300) -> TerminalRun:
    """Runs argv in a pseudo-terminal `columns` wide; types Ctrl-C once `ctrl_c_after` appears in its output."""
    pid, master = pty.fork()
    if pid == 0:  # the child: file descriptors 0, 1 and 2 are the terminal
        try:
            # a user's shell starts commands with Ctrl-C at its default; the test process may have had SIGINT
            # ignored by a library it ran earlier, and an ignored signal stays ignored across exec
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
            os.execvpe(argv[0], list(argv), env if env is not None else os.environ)
        finally:
            os._exit(127)  # exec failed: never run the parent's code (pytest) in the child
    chunks, sent = [], None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        if ctrl_c_after is not None and sent is None and ctrl_c_after.encode() in b"".join(chunks):
            os.write(master, b"\x03")
            sent = time.monotonic()
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return TerminalRun(b"".join(chunks).decode(errors="replace"), os.waitstatus_to_exitcode(status),
                       None if sent is None else time.monotonic() - sent)
