"""Wire knowledge of each API: request checks and error shapes. No I/O here."""
