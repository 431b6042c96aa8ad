"""SGLang's radix prefix cache over a page pool, with token spans instead of per-page hashes.

SGLang keeps every cached page in a radix tree: edges hold runs of whole pages, a request locks
the path it uses, and LRU eviction cuts unlocked leaves (docs/schedulers.md). Its default page is
one token, so a tree keyed by per-page hashes would hold one entry per token. Here an edge is a
*span* ``[start, end)`` of one sequence's tokens: sequences are runs of pieces (``TokenSeq``:
``actors.hashing``'s pieces, token ``o`` of a piece being ``(source, o)``), so two spans are
compared a piece at a time and a 10,000-token prompt is a handful of comparisons at any page size.

Positions are absolute: a node's span ``[start, end)`` of its sequence sits at depth ``start`` of
the tree (a path from the root is a prefix). Counts are tokens unless named ``_pages``; every edge
holds whole pages. The cache owns the page pool: ``free_pages`` are unused, tree pages are
``evictable_tokens`` (no live request locks them) or ``protected_tokens``; the rest are owned by
requests outside the tree (their uncached tails).
"""

from __future__ import annotations

from bisect import bisect_right
from heapq import heappop, heappush

from aisim.actors.engine.kv_cache import REMOVED, STORED
from aisim.actors.hashing import hash_view


class TokenSeq:
    """A request's tokens (prompt, then its generated output) as pieces: ``src[i]`` the source of
    piece i, ``ends[i]`` the token position where it ends (ascending); ``hashes``: the chained
    hashes of its whole pages, when its rank publishes KV events (page i: tokens [i P, (i+1) P))."""

    __slots__ = ("src", "ends", "hashes")

    def __init__(self, src: list[int], ends: list[int]) -> None:
        self.src = src
        self.ends = ends
        self.hashes = None

    def page_key(self, pos: int, page: int) -> tuple:
        """The identity of the page starting at ``pos``: its parts (source, offset, tokens)."""
        ends = self.ends
        i = bisect_right(ends, pos)
        off = pos - (ends[i - 1] if i else 0)
        take = ends[i] - pos
        if take >= page:
            return (self.src[i], off, page)
        key = [self.src[i], off, take]
        left = page - take
        while left > 0 and i + 1 < len(ends):
            i += 1
            take = min(left, ends[i] - ends[i - 1])
            key += (self.src[i], 0, take)
            left -= take
        return tuple(key)


def common_tokens(a: TokenSeq, b: TokenSeq, pos: int, limit: int) -> int:
    """How many tokens from ``pos`` on (at most ``limit``) ``a`` and ``b`` hold alike."""
    n = 0
    ae, be, asrc, bsrc = a.ends, b.ends, a.src, b.src
    while n < limit:
        p = pos + n
        i = bisect_right(ae, p)
        j = bisect_right(be, p)
        if i >= len(ae) or j >= len(be) or asrc[i] != bsrc[j]:
            break
        oa = p - (ae[i - 1] if i else 0)
        if oa != p - (be[j - 1] if j else 0):
            break
        run = min(ae[i], be[j]) - p
        n += run
    return min(n, limit)


class RadixNode:
    __slots__ = ("parent", "children", "seq", "start", "end", "lock", "last_ms", "nid", "published")

    def __init__(self, parent, seq, start: int, end: int, nid: int, now_ms: float, published: bool = False) -> None:
        self.parent = parent
        self.children: dict = {}
        self.seq = seq
        self.start = start
        self.end = end
        self.lock = 0
        self.last_ms = now_ms
        self.nid = nid
        self.published = published  # its pages were announced in a STORED event (and go in a REMOVED one)


class RadixCache:
    """The page pool and radix tree of one SGLang rank."""

    def __init__(self, num_pages: int, page_size: int, record_events: bool = False) -> None:
        self.page = page_size
        self.num_pages = num_pages
        self.free_pages = num_pages
        self.root = RadixNode(None, None, 0, 0, 0, 0.0)
        self.root.lock = 1  # never evicted
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.version = 0  # bumped whenever pages are given back or unlocked (the headroom may grow)
        self._heap: list = []  # (last access ms, node id, node): unlocked leaves, lazily invalidated
        self._next_id = 1
        # KV events (``actors.engine.kv_cache``'s kinds): STORED when a published span enters the
        # tree, REMOVED (last page first) when its pages are evicted
        self.events: list | None = [] if record_events else None

    # -- pool ---------------------------------------------------------------------------
    @property
    def headroom_tokens(self) -> int:
        """Tokens a request can be given now: free pages and unlocked cached ones."""
        return self.free_pages * self.page + self.evictable_tokens

    def take_pages(self, pages: int) -> bool:
        """``pages`` pages for a request (evicting LRU cache as needed); False when not there."""
        if pages > self.free_pages:
            self.evict((pages - self.free_pages) * self.page)
            if pages > self.free_pages:
                return False
        self.free_pages -= pages
        return True

    def give_pages(self, pages: int) -> None:
        self.free_pages += pages
        self.version += 1

    # -- tree -----------------------------------------------------------------------------
    def match(self, seq: TokenSeq, limit: int, now_ms: float) -> tuple[RadixNode, int]:
        """The deepest node of the cached prefix of ``seq`` (at most ``limit`` tokens, whole pages)
        and its depth; a match ending inside an edge splits it there. Refreshes the path's access
        time."""
        node = self.root
        pos = 0
        page = self.page
        limit -= limit % page
        while pos < limit:
            child = node.children.get(seq.page_key(pos, page))
            if child is None:
                break
            n = common_tokens(child.seq, seq, pos, min(child.end, limit) - pos)
            n -= n % page
            if n == 0:
                break
            if pos + n < child.end:
                child = self._split(child, pos + n)
            child.last_ms = now_ms
            node = child
            pos += n
        return node, pos

    def peek(self, seq: TokenSeq, limit: int) -> int:
        """How many of the first ``limit`` tokens of ``seq`` are cached (whole pages), changing nothing."""
        node = self.root
        pos = 0
        page = self.page
        while pos < limit:
            child = node.children.get(seq.page_key(pos, page)) if limit - pos >= page else None
            if child is None:
                break
            n = common_tokens(child.seq, seq, pos, min(child.end, limit) - pos)
            n -= n % page
            pos += n
            if pos < child.end or n == 0:
                break
            node = child
        return pos

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node``'s edge at depth ``at``: a new node takes ``[start, at)``, ``node`` keeps the rest."""
        top = RadixNode(node.parent, node.seq, node.start, at, self._next_id, node.last_ms, node.published)
        self._next_id += 1
        top.lock = node.lock
        page = self.page
        node.parent.children[node.seq.page_key(node.start, page)] = top
        top.children[node.seq.page_key(at, page)] = node
        node.parent = top
        node.start = at
        return top

    def insert(self, node: RadixNode, seq: TokenSeq, upto: int, now_ms: float,
               publish: bool = False) -> tuple[RadixNode, int]:
        """Cache ``seq`` up to ``upto`` (whole pages) below ``node``, the deepest node of its cached
        prefix: returns the new deepest node and how many of the tokens were already cached (by
        someone else: the caller's copies of them are duplicates). ``publish``: the new pages are
        announced in a STORED event (when events are recorded)."""
        pos = node.end
        page = self.page
        dup = 0
        while pos < upto:
            key = seq.page_key(pos, page)
            child = node.children.get(key)
            if child is None:
                published = publish and self.events is not None
                leaf = RadixNode(node, seq, pos, upto, self._next_id, now_ms, published)
                self._next_id += 1
                node.children[key] = leaf
                self.evictable_tokens += upto - pos  # (unlocked until the caller locks it)
                if published:
                    self.events.append((STORED, seq.hashes[pos // page: upto // page]))
                node = leaf
                pos = upto
                break
            n = common_tokens(child.seq, seq, pos, min(child.end, upto) - pos)
            n -= n % page
            if pos + n < child.end:
                child = self._split(child, pos + n)
            child.last_ms = now_ms
            dup += n
            node = child
            pos += n
        return node, dup

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock == 0:
                n = node.end - node.start
                self.evictable_tokens -= n
                self.protected_tokens += n
            node.lock += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        self.version += 1
        leaf = node
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                n = node.end - node.start
                self.evictable_tokens += n
                self.protected_tokens -= n
            node = node.parent
        if leaf is not self.root and leaf.lock == 0 and not leaf.children:
            heappush(self._heap, (leaf.last_ms, leaf.nid, leaf))

    def release_leaf(self, node: RadixNode) -> None:
        """A node the caller created unlocked (or left unlocked): evictable when it is a leaf."""
        if node is not self.root and node.lock == 0 and not node.children:
            heappush(self._heap, (node.last_ms, node.nid, node))

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` tokens of unlocked cache, least recently used leaves first
        (a leaf bigger than needed loses its newest pages only); returns the tokens freed."""
        page = self.page
        heap = self._heap
        freed = 0
        victims = [] if self.events is not None else None
        while freed < tokens and heap:
            last_ms, nid, node = heappop(heap)
            if node.lock or node.children or node.parent is None or node.last_ms != last_ms:
                continue  # (stale entry: locked, grown a child, removed or touched since)
            size = node.end - node.start
            want = -(-(tokens - freed) // page) * page
            if want < size:
                if victims is not None and node.published:
                    victims.extend(node.seq.hashes[(node.end - want) // page: node.end // page][::-1])
                node.end -= want
                self.evictable_tokens -= want
                self.free_pages += want // page
                freed += want
                heappush(heap, (last_ms, nid, node))
                continue
            parent = node.parent
            if victims is not None and node.published:
                victims.extend(node.seq.hashes[node.start // page: node.end // page][::-1])
            del parent.children[node.seq.page_key(node.start, page)]
            node.parent = None
            self.evictable_tokens -= size
            self.free_pages += size // page
            freed += size
            if parent is not self.root and parent.lock == 0 and not parent.children:
                heappush(heap, (parent.last_ms, parent.nid, parent))
        if victims:
            self.events.append((REMOVED, hash_view(victims)))
        return freed
