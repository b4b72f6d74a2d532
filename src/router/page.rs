//! One page of a listing: what the `*/list` handlers of the extensions (tasks, trajectory,
//! mail) answer as `{items, hasMore, nextCursor?}`, where the cursor is the id of the page's
//! last item.

/// A page of items, and where the next one starts.
#[derive(Debug)]
pub struct Page<T> {
    /// At most the limit.
    pub items: Vec<T>,
    /// Whether another matching item follows.
    pub has_more: bool,
    /// The last item's id when another follows.
    pub next_cursor: Option<String>,
}

/// The first `limit` items of `matching` (already filtered, in listing order); `id_of` names
/// an item for the cursor.
pub fn take_page<T>(
    matching: impl Iterator<Item = T>,
    limit: usize,
    id_of: impl Fn(&T) -> String,
) -> Page<T> {
    let mut items = Vec::new();
    let mut has_more = false;
    for item in matching {
        if items.len() == limit {
            has_more = true;
            break;
        }
        items.push(item);
    }
    let next_cursor = if has_more {
        items.last().map(&id_of)
    } else {
        None
    };
    Page {
        items,
        has_more,
        next_cursor,
    }
}
