"""A child process whose merged output a test reads as it comes (to wait for a line)."""

from __future__ import annotations

import signal
import subprocess
import threading


class Output:
    """A child process's merged output, read by a thread as it comes."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self.thread.join(timeout=10)
        return "".join(self.lines)


def start(command: list[str], **options) -> Output:
    return Output(
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **options)
    )


def stop(output: Output, timeout: float = 30) -> str:
    """SIGTERM, then SIGKILL if it does not end within ``timeout``; its whole output."""
    if output.process.poll() is None:
        output.process.send_signal(signal.SIGTERM)
        try:
            output.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            output.process.kill()
            output.process.wait()
    return output.text()
