//! What is around the operator's work in its process: the admin server ([`admin`]), the
//! metrics ([`metrics`]), the Events it writes ([`events`]), the webhook's certificate
//! authority ([`certs`]), and the commands the chart runs against an installation
//! ([`installation`]: `check` and `cleanup`).

pub mod admin;
pub mod certs;
pub mod events;
pub mod installation;
pub mod metrics;
