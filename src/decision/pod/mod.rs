//! The pod as the cluster will run it: where its template lets it land ([`constraints`]), what
//! it asks for ([`resources`]), what its namespace's LimitRanges do to it ([`limits`]), the CPU
//! it really gets ([`cpu`]) and whole cores near the GPU ([`whole_cores`]).

pub(in crate::decision) mod constraints;
pub mod cpu;
pub mod limits;
pub(in crate::decision) mod resources;
pub(in crate::decision) mod whole_cores;
