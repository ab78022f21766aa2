//! duet
