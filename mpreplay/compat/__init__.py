"""Compatibility layers: other replay libraries' APIs over mpreplay's buffers."""
