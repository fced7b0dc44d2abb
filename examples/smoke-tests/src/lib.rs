//! The examples' smoke tests live under `tests/`; this library is empty.
