"""A fake NCCL RAS server on loopback that replays transcripts (tests/data/nccl_ras/) over the real wire
protocol: `CLIENT PROTOCOL` handshake, `TIMEOUT` and `SET FORMAT` answered `OK`, `STATUS` prints the
next transcript of the current format and closes, `MONITOR` prints its banner and events, `diagnostics`
its report. Bounded: it serves until the test closes it, on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "nccl_ras"


def transcript(name: str) -> str:
    return (DATA / name).read_text()


@dataclass
class FakeRas:
    text: list[str] = field(default_factory=list)  # STATUS answers in text, one per query (the last repeats)
    json: list[str] = field(default_factory=list)
    monitor: list[tuple[float, str]] = field(default_factory=list)  # (delay s, chunk) after the banner
    monitor_format: str = "json"
    diagnostics: str = ""
    json_supported: bool = True  # False: an NCCL older than 2.28.7 (SET FORMAT unknown)
    queries: int = 0
    commands: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None
    port: int = 0

    async def start(self) -> FakeRas:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fmt = "text"
        try:
            while True:
                raw = await reader.readline()
                if not raw:
                    return
                line = raw.decode().strip()
                self.commands.append(line)
                word = line.upper()
                if word.startswith("CLIENT PROTOCOL"):
                    writer.write(b"SERVER PROTOCOL 2\n")
                elif word.startswith("TIMEOUT"):
                    writer.write(b"OK\n")
                elif word.startswith("SET FORMAT"):
                    if not self.json_supported:
                        writer.write(b"ERROR: unknown command\n")
                    else:
                        fmt = line.split()[-1].lower()
                        writer.write(b"OK\n")
                elif word in ("STATUS", "VERBOSE STATUS"):
                    answers = self.json if fmt == "json" else self.text
                    i = min(self.queries, len(answers) - 1)
                    self.queries += 1
                    writer.write(answers[i].encode())
                    await writer.drain()
                    return
                elif word == "MONITOR":
                    writer.write(
                        b"RAS Monitor Mode - watching for peer changes (Ctrl+C to exit)...\n" if fmt == "text" else b""
                    )
                    await writer.drain()
                    for delay, chunk in self.monitor:
                        await asyncio.sleep(delay)
                        writer.write(chunk.encode())
                        await writer.drain()
                    await asyncio.sleep(30)  # stays open as a job would; the test closes first
                    return
                elif word == "DIAGNOSTICS":
                    writer.write(self.diagnostics.encode())
                    await writer.drain()
                    return
                else:
                    writer.write(b"ERROR: unknown command\n")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()
