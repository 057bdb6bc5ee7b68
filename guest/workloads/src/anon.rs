//! An anonymous working set: every page of a region written over and over.

use std::thread;
use std::time::Instant;

use crate::progress::Progress;
use crate::region::Region;

/// Bytes written between two checks of the deadline and progress updates.
const CHUNK: usize = 1 << 20;

/// Writes one word to every page of the first `size` bytes of `region`, one
/// MiB at a time and over and over, until `deadline` (forever when `None`),
/// counting a whole page in `progress` for each page written. A new value on
/// each pass keeps every page dirty. With `size` 0 it just sleeps. `size` is
/// a multiple of the page size.
pub fn touch_until(
    region: &mut Region,
    size: usize,
    deadline: Option<Instant>,
    progress: &Progress,
) {
    touch_until_each(region, size, deadline, progress, || {});
}

/// [`touch_until`], calling `each` after each piece of at most a MiB written
/// (a pass's last may be shorter); never with `size` 0.
pub fn touch_until_each(
    region: &mut Region,
    size: usize,
    deadline: Option<Instant>,
    progress: &Progress,
    mut each: impl FnMut(),
) {
    let in_time = || deadline.is_none_or(|deadline| Instant::now() < deadline);
    if size == 0 {
        while in_time() {
            match deadline {
                Some(deadline) => thread::sleep(deadline.saturating_duration_since(Instant::now())),
                None => thread::park(),
            }
        }
        return;
    }
    let mut pass = 0;
    let mut offset = 0;
    while in_time() {
        let end = (offset + CHUNK).min(size);
        region.touch(offset..end, pass);
        progress.add((end - offset) as u64);
        each();
        offset = end;
        if offset == size {
            (offset, pass) = (0, pass + 1);
        }
    }
}

/// Writes one word to every page of the first `size` bytes of `region`
/// once, counting each page in `progress`.
pub fn touch_once(region: &mut Region, size: usize, progress: &Progress) {
    for start in (0..size).step_by(CHUNK) {
        let end = (start + CHUNK).min(size);
        region.touch(start..end, 1);
        progress.add((end - start) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::PAGE;
    use std::time::Duration;

    #[test]
    fn counts_the_bytes_of_pages_written() {
        let mut region = Region::new(3 * PAGE).unwrap();
        let progress = Progress::new();
        let deadline = Instant::now() + Duration::from_millis(20);
        touch_until(&mut region, 3 * PAGE, Some(deadline), &progress);
        assert!(Instant::now() >= deadline);
        let bytes = progress.snapshot().bytes;
        assert!(
            bytes > 0 && bytes.is_multiple_of(3 * PAGE as u64),
            "{bytes}"
        );
    }

    #[test]
    fn each_mib_written_is_told() {
        let size = 2 * CHUNK + PAGE;
        let mut region = Region::new(size).unwrap();
        let progress = Progress::new();
        let deadline = Instant::now() + Duration::from_millis(20);
        let mut told = 0;
        touch_until_each(&mut region, size, Some(deadline), &progress, || told += 1);
        // Two whole MiB and a page each pass.
        let bytes = progress.snapshot().bytes;
        let passes = bytes / size as u64;
        let partial = bytes % size as u64;
        let in_pass = (partial as usize).div_ceil(CHUNK) as u64;
        assert_eq!(told, passes * 3 + in_pass, "{bytes} bytes");
    }

    #[test]
    fn touching_once_backs_every_page_once() {
        let size = CHUNK + 3 * PAGE;
        let mut region = Region::new(size).unwrap();
        let progress = Progress::new();
        assert_eq!(region.resident_pages().unwrap(), 0);
        touch_once(&mut region, size, &progress);
        assert_eq!(region.resident_pages().unwrap(), size / PAGE);
        assert_eq!(progress.snapshot().bytes, size as u64);
    }

    #[test]
    fn size_zero_sleeps_until_the_deadline() {
        let progress = Progress::new();
        let deadline = Instant::now() + Duration::from_millis(20);
        touch_until(&mut Region::new(0).unwrap(), 0, Some(deadline), &progress);
        assert!(Instant::now() >= deadline);
        assert_eq!(progress.snapshot().bytes, 0);
    }
}
