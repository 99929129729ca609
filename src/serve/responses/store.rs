//! Responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory, bounded
//! by a count and by bytes (`--responses-store`, `--responses-store-mb`), the oldest dropped
//! first. Each keeps the input items its prompt was rendered from (its predecessors' included,
//! `instructions` excepted, as OpenAI does) and the response object, so a follow-up renders
//! the whole conversation.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Stored {
    pub id: String,
    /// The conversation's input items up to this response.
    pub input: Vec<Value>,
    /// The response object (its `output` follows `input`).
    pub response: Value,
    bytes: usize,
}

pub struct Store {
    max_count: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    items: VecDeque<Stored>,
    bytes: usize,
}

impl Store {
    pub fn new(max_count: usize, max_bytes: usize) -> Self {
        Store { max_count, max_bytes, inner: Mutex::default() }
    }

    /// Keeps a response; older ones go when the bounds are passed (one bigger than the whole
    /// store is not kept).
    pub fn put(&self, id: String, input: Vec<Value>, response: Value) {
        let bytes = id.len()
            + input.iter().map(|v| v.to_string().len()).sum::<usize>()
            + response.to_string().len();
        if self.max_count == 0 || bytes > self.max_bytes {
            tracing::debug!("response {id} not stored: {bytes} bytes");
            return;
        }
        let Ok(mut s) = self.inner.lock() else { return };
        while s.items.len() >= self.max_count || s.bytes + bytes > self.max_bytes {
            let Some(old) = s.items.pop_front() else { break };
            s.bytes -= old.bytes;
        }
        s.bytes += bytes;
        s.items.push_back(Stored { id, input, response, bytes });
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().ok()?.items.iter().find(|s| s.id == id).cloned()
    }

    /// Whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        let Ok(mut s) = self.inner.lock() else { return false };
        let Some(at) = s.items.iter().position(|x| x.id == id) else { return false };
        if let Some(old) = s.items.remove(at) {
            s.bytes -= old.bytes;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounds_drop_the_oldest() {
        let s = Store::new(2, 1 << 20);
        for id in ["a", "b", "c"] {
            s.put(id.into(), vec![json!("x")], json!({"id": id}));
        }
        assert!(s.get("a").is_none());
        assert!(s.get("b").is_some() && s.get("c").is_some());
        assert!(s.delete("b") && !s.delete("b"));
        let s = Store::new(100, 50);
        s.put("a".into(), vec![], json!({"t": "x".repeat(20)}));
        s.put("b".into(), vec![], json!({"t": "y".repeat(20)}));
        assert!(s.get("a").is_none() && s.get("b").is_some());
        s.put("big".into(), vec![], json!({"t": "z".repeat(100)}));
        assert!(s.get("big").is_none() && s.get("b").is_some());
    }
}
