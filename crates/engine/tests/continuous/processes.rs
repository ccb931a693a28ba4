//! Several processes enqueue and serve at once (written next).
