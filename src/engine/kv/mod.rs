//! KV-cache bookkeeping for the continuous-batching engine: which device blocks hold which
//! sequence positions ([`blocks`]). Pure logic, no tensors: the attention kernels read the
//! block tables and slots this module hands out.

pub mod blocks;

pub use blocks::{BlockConfig, BlockManager, GroupSpec, KvError, NoSpace, SeqId};
