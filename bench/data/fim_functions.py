# Held-out functions for the fill-in-the-middle row (bench/fim.py): written for this bench,
# public domain (CC0). bench/fim.py removes the middle lines of each function's body and asks
# each server to fill them in. Never imported or run by the bench; keep it valid Python.


def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals; the result is sorted by start."""
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def word_frequencies(text, stop_words=()):
    """Count lower-cased words of `text`, skipping `stop_words`; most common first."""
    counts = {}
    for raw in text.split():
        word = raw.strip(".,;:!?\"'()").lower()
        if not word or word in stop_words:
            continue
        counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ranked


def binary_search(values, target):
    """Index of `target` in the sorted list `values`, or -1."""
    low, high = 0, len(values) - 1
    while low <= high:
        middle = (low + high) // 2
        if values[middle] == target:
            return middle
        if values[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1


def parse_key_values(line, separator=";"):
    """Parse 'a=1; b=two' into {'a': '1', 'b': 'two'}; items without '=' are ignored."""
    result = {}
    for item in line.split(separator):
        if "=" not in item:
            continue
        key, value = item.split("=", 1)
        key = key.strip()
        if key:
            result[key] = value.strip()
    return result


def flatten(nested):
    """Flatten arbitrarily nested lists and tuples into one list."""
    flat = []
    stack = [iter(nested)]
    while stack:
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if isinstance(item, (list, tuple)):
            stack.append(iter(item))
        else:
            flat.append(item)
    return flat


def moving_average(samples, window):
    """Averages of each run of `window` consecutive samples."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(samples):
        total += value
        if index >= window:
            total -= samples[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages


def is_balanced(text):
    """True when every bracket in `text` is closed in the right order."""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in pairs:
            if not stack or stack[-1] != pairs[char]:
                return False
            stack.pop()
    return not stack


def chunked(items, size):
    """Split `items` into lists of `size` (the last one may be shorter)."""
    if size < 1:
        raise ValueError("size must be at least 1")
    chunks = []
    current = []
    for item in items:
        current.append(item)
        if len(current) == size:
            chunks.append(current)
            current = []
    if current:
        chunks.append(current)
    return chunks


def roman_to_int(numeral):
    """Value of a Roman numeral such as 'MCMXCIV'."""
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    previous = 0
    for char in reversed(numeral.upper()):
        value = values[char]
        if value < previous:
            total -= value
        else:
            total += value
            previous = value
    return total


def group_by(records, key):
    """Group dicts by the value of `key`, keeping their order within each group."""
    groups = {}
    for record in records:
        value = record.get(key)
        if value is None:
            continue
        if value not in groups:
            groups[value] = []
        groups[value].append(record)
    return groups


def caesar_shift(text, shift):
    """Shift the letters of `text` by `shift` places, keeping case and other characters."""
    out = []
    for char in text:
        if "a" <= char <= "z":
            base = ord("a")
        elif "A" <= char <= "Z":
            base = ord("A")
        else:
            out.append(char)
            continue
        out.append(chr(base + (ord(char) - base + shift) % 26))
    return "".join(out)


def primes_below(limit):
    """All primes below `limit` by the sieve of Eratosthenes."""
    if limit < 3:
        return []
    sieve = [True] * limit
    sieve[0] = sieve[1] = False
    for number in range(2, int(limit ** 0.5) + 1):
        if sieve[number]:
            for multiple in range(number * number, limit, number):
                sieve[multiple] = False
    primes = [n for n, is_prime in enumerate(sieve) if is_prime]
    return primes


def longest_common_prefix(words):
    """The longest string every word starts with."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        while not word.startswith(prefix):
            prefix = prefix[:-1]
            if not prefix:
                return ""
    return prefix


def run_length_encode(text):
    """'aaab' -> [('a', 3), ('b', 1)]."""
    encoded = []
    previous = None
    count = 0
    for char in text:
        if char == previous:
            count += 1
            continue
        if previous is not None:
            encoded.append((previous, count))
        previous = char
        count = 1
    if previous is not None:
        encoded.append((previous, count))
    return encoded


def transpose(matrix):
    """Rows become columns; every row must have the same length."""
    if not matrix:
        return []
    width = len(matrix[0])
    for row in matrix:
        if len(row) != width:
            raise ValueError("ragged matrix")
    columns = []
    for column in range(width):
        columns.append([row[column] for row in matrix])
    return columns


def parse_duration(text):
    """Seconds in a duration such as '1h30m', '45s' or '2m5s'."""
    units = {"h": 3600, "m": 60, "s": 1}
    total = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            number += char
        elif char in units and number:
            total += int(number) * units[char]
            number = ""
        else:
            raise ValueError(f"bad duration: {text!r}")
    if number:
        raise ValueError(f"missing unit in {text!r}")
    return total


def top_k(scores, k):
    """The `k` keys of `scores` with the highest values, highest first, ties by key."""
    if k <= 0:
        return []
    items = list(scores.items())
    items.sort(key=lambda item: (-item[1], item[0]))
    best = []
    for key, _ in items[:k]:
        best.append(key)
    return best


def dedupe(items):
    """The items in their first-seen order, each once."""
    seen = set()
    unique = []
    for item in items:
        if item in seen:
            continue
        seen.add(item)
        unique.append(item)
    return unique


def clamp_all(values, low, high):
    """Each value clamped into [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    clamped = []
    for value in values:
        if value < low:
            value = low
        elif value > high:
            value = high
        clamped.append(value)
    return clamped


def histogram(values, bins, low, high):
    """Counts of `values` in `bins` equal bins over [low, high); values outside are dropped."""
    if bins < 1 or high <= low:
        raise ValueError("need at least one bin over a non-empty range")
    counts = [0] * bins
    width = (high - low) / bins
    for value in values:
        if low <= value < high:
            index = int((value - low) / width)
            counts[min(index, bins - 1)] += 1
    return counts
