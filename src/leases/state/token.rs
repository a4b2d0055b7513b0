//! Tokens are stored only as their SHA-256: a token is shown once, to the caller of lease_acquire,
//! and not even a superuser reading the table (or a backup of it) can use it afterwards.
use pgrx::Uuid;

/// What the table keeps of a token: SHA-256 of its 16 bytes, the same value as SQL's
/// `sha256(uuid_send(token))`. Hashed here rather than in the statements because PostgreSQL's
/// sha256() sets up an OpenSSL digest context on every call, which costs more CPU than the hash
/// itself, on every acquire and release (docs/benchmarks.md).
pub fn token_hash(token: Uuid) -> Vec<u8> {
    token_hash_array(token).to_vec()
}

pub fn token_hash_array(token: Uuid) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}
