//! CPU backend
