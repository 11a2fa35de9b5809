"""The pure core: what the extender decides, over plain data. No I/O library, nothing from the layers above."""
