//! No management: every VM keeps its size and KSM is left alone. The baseline that
//! other policies are compared with.

use super::{Policy, PolicyInput, PolicyOutput};
use crate::action::Reason;

/// The policy that decides nothing.
#[derive(Clone, Debug, Default)]
pub struct Unmanaged;

impl Policy for Unmanaged {
    fn name(&self) -> &str {
        "none"
    }

    fn decide(&mut self, input: &PolicyInput<'_>) -> PolicyOutput {
        let hold = Reason::new("none", "memory is not managed");
        let holds = input
            .vms
            .iter()
            .map(|vm| (vm.name.to_string(), hold.clone()))
            .collect();
        PolicyOutput {
            holds,
            ..PolicyOutput::default()
        }
    }
}
