"""Interoperability with other tools' formats (TorchRec)."""
