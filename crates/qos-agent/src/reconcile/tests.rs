//! Tests of the reconciler (filled below).
