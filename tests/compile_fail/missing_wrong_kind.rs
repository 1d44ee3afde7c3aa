// A data type is not an index type: the filter family is keyed by index type.

use fraglink::fragments::{Bitset, FilterFragment, F32};

fn main() {
    let _ = fraglink::fragment::info_of::<FilterFragment<Bitset, F32>>();
}
