"""Erasure coding: the codec seam (ISA-L, numpy reference), stripe math, fragment headers."""

from loomfs.ec.codec import Codec, make_codec

__all__ = ["Codec", "make_codec"]
