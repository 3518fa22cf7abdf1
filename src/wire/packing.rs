//! What the packed messages (check and decision batches) share: a message whose archived layout
//! is another type's, packed from it by its own rkyv `Archive` impl.

use rkyv::rancor::{Fallible, Source};
use rkyv::{Archive, Place, Serialize};

use super::messages::Refusal;

/// What packing a message leaves for rkyv's second pass: the packed value itself (resolving
/// needs its lengths) and its resolver.
pub struct Packed<P: Archive> {
    packed: P,
    resolver: P::Resolver,
}

impl<P: Archive> Packed<P> {
    /// Writes `packed`'s contents (rkyv's first pass).
    pub(crate) fn serialize<S>(packed: P, serializer: &mut S) -> Result<Self, S::Error>
    where
        P: Serialize<S>,
        S: Fallible + ?Sized,
    {
        let resolver = packed.serialize(serializer)?;
        Ok(Packed { packed, resolver })
    }

    /// Writes the archived value itself (rkyv's second pass).
    pub(crate) fn resolve(self, out: Place<P::Archived>) {
        self.packed.resolve(self.resolver, out);
    }
}

impl<P: Archive + std::fmt::Debug> std::fmt::Debug for Packed<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("packed", &self.packed)
            .finish_non_exhaustive()
    }
}

/// A packed message that does not hold together (its refusal's message), as rkyv's error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UnpackError(String);

/// `refusal` as the error of rkyv's deserializer `E`.
pub(crate) fn unpack_error<E: Source>(refusal: Refusal) -> E {
    E::new(UnpackError(refusal.1))
}
