document.body.classList.add("js");
function show(item, id) {
  for (const map of item.querySelectorAll(".map")) map.classList.toggle("shown", map.id === id);
  for (const word of item.querySelectorAll(".word")) word.classList.toggle("active", word.dataset.map === id);
}
function select(item, id) { item.dataset.selected = id; show(item, id); }
function fromHash() {
  const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  for (const item of document.querySelectorAll(".item")) {
    const first = item.querySelector(".map");
    if (!first) continue;
    select(item, target && target.classList.contains("map") && item.contains(target) ? target.id
                 : (item.dataset.selected || first.id));
  }
}
for (const word of document.querySelectorAll(".word")) {
  const item = word.closest(".item");
  word.addEventListener("mouseenter", () => show(item, word.dataset.map));
  word.addEventListener("focus", () => show(item, word.dataset.map));
  word.addEventListener("mouseleave", () => show(item, item.dataset.selected));
  word.addEventListener("blur", () => show(item, item.dataset.selected));
  word.addEventListener("click", (event) => {
    event.preventDefault();
    history.replaceState(null, "", "#" + word.dataset.map);
    select(item, word.dataset.map);
  });
}
window.addEventListener("hashchange", fromHash);
fromHash();
