//! The `breakwater` command line.
fn main() {}
