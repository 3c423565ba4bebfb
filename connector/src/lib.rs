//! The KV connector: what a serving engine embeds to save and load KV between instances.
#![forbid(unsafe_code)]
