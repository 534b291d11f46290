//! The cluster as the decision's callers see it: one watch per kind shared by the webhook and
//! the controllers ([`caches`]), the node index kept from the Node cache ([`node_views`]), the
//! views over them or over memory ([`view`]), what runs
//! taught the memory model ([`learned`]), the one read of a ConfigMap a job references
//! ([`referenced`]), the sizer's traces of models' steps ([`traces`]), and
//! the tolerant reader that keeps one object that
//! does not read from stopping a list or a watch ([`tolerant`]).

pub mod caches;
pub mod learned;
pub mod node_views;
pub mod referenced;
pub mod tolerant;
pub mod traces;
pub mod view;
