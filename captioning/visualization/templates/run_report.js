const table = document.querySelector("table.images");
if (table) {
  const body = table.tBodies[0];
  for (const [column, header] of [...table.tHead.rows[0].cells].entries()) {
    const button = header.querySelector("button");
    if (!button) continue;
    button.addEventListener("click", () => {
      const order = header.getAttribute("aria-sort") === header.dataset.worst
        ? (header.dataset.worst === "ascending" ? "descending" : "ascending") : header.dataset.worst;
      for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
      header.setAttribute("aria-sort", order);
      const sign = order === "ascending" ? 1 : -1;
      const value = (row) => row.cells[column].dataset.value;
      const rows = [...body.rows].sort((a, b) => {
        const x = value(a), y = value(b);  // images without the score go last either way
        if (x === "" || y === "") return (x === "") - (y === "");
        return sign * (Number(x) - Number(y)) || Number(a.dataset.index) - Number(b.dataset.index);
      });
      body.append(...rows);
    });
  }
}
function openItem() {
  const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  const item = target ? target.closest(".item") : null;
  for (const other of document.querySelectorAll(".item")) other.classList.toggle("open", other === item);
  if (item) item.scrollIntoView();
}
window.addEventListener("hashchange", openItem);
openItem();
